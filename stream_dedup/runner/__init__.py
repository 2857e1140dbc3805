"""The delivery contract shared by `serve` and `replay`, its edges and its signals."""
