"""A page's namespace from its own message (--namespace-field; pure): a field of a JSON
message (a.b: a nested one, as --carry-fields reads them) or, for the html and warc input
formats, a Kafka header of that name (the first of that name, in any case).

- Absent (or JSON null, or a header without a value): "", and the page is decided in the
  process's namespace (--namespace; Deduplicator.namespace_of).
- Present but unusable: not a string, empty, not a namespace name (namespaces.check_name:
  1-128 letters, digits and . _ : @ + - /, starting with a letter or a digit) or, a header,
  not UTF-8. The record is rejected, kind `bad-namespace`, and goes to the dead-letter topic:
  deciding it in the process's namespace instead would match it against another crawl's
  pages, and store it there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stream_dedup.config_checks import FieldPath
from stream_dedup.errors import PageError
from stream_dedup.index.namespaces import NamespaceError, check_name


def field_at(obj: Any, path: FieldPath) -> Any:
    """The value at `path` in a JSON object (None where a step is missing or not an object)."""
    for name in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(name)
    return obj


def namespace_value(value: Any, named: str) -> str:
    """`value` (a message's, None: absent) as a namespace name; "" for none; a PageError
    (bad-namespace) naming `named` (where it came from) if it cannot be one."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PageError("bad-namespace", f"the namespace, {named}, must be a string, got "
                                         f"{_shown(value)}")
    try:
        return check_name(value, f"the namespace, {named}")
    except NamespaceError as exc:
        raise PageError("bad-namespace", str(exc)) from None


def namespace_in(obj: dict[str, Any], field: str) -> str:
    """The namespace a JSON message names in `field` ("a.b": nested); "" for none."""
    return namespace_value(field_at(obj, tuple(field.split("."))), f"field {field!r}")


def namespace_in_headers(headers: Sequence[tuple[str, bytes | None]], name: str) -> str:
    """The namespace the Kafka header `name` (the first of that name, any case) gives."""
    wanted = name.lower()
    for key, raw in headers:
        if key.lower() != wanted:
            continue
        if raw is None:
            return ""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PageError("bad-namespace", f"the namespace, header {name!r}, is not UTF-8 "
                                             f"({exc.reason} at byte {exc.start})") from None
        return namespace_value(text, f"header {name!r}")
    return ""


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
