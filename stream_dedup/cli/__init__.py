"""The command line: `stream-dedup replay | serve | index | curve | clusters | sample`."""
