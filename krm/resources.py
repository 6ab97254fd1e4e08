"""ResourceLists: parsing and serialising them as YAML, and the structured `results` a function
reports in its output.

A ResourceList is `{apiVersion: config.kubernetes.io/v1, kind: ResourceList, items: [...],
functionConfig: {...}, results: [...]}`. A result:

    severity: error | warning | info       (absent: error)
    message: text                          (required)
    resourceRef: {apiVersion, kind, name, namespace}
    field: {path, currentValue, proposedValue}
    file: {path, index}
    tags: {key: value}
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kruntimes.krm import errors
from kruntimes.krm.limits import MAX_RESOURCE_LIST_BYTES, MAX_RESULT_VALUE_NODES, MAX_RESULTS

API_VERSION = "config.kubernetes.io/v1"
KIND = "ResourceList"
_API_VERSIONS = ("config.kubernetes.io/v1", "config.kubernetes.io/v1alpha1")

# libyaml's safe loader and dumper when PyYAML was built with it (about ten times faster)
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourceRef(_Model):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""


class FieldRef(_Model):
    path: str
    currentValue: Any = None
    proposedValue: Any = None


class FileRef(_Model):
    path: str
    index: int = Field(default=0, ge=0)


class Result(_Model):
    severity: Literal["error", "warning", "info"] = "error"
    message: str
    resourceRef: ResourceRef | None = None
    field: FieldRef | None = None
    file: FileRef | None = None
    tags: dict[str, str] = Field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=False)


class YamlError(ValueError):
    """The bytes are not the YAML expected (the message says where)."""


class ExpansionTooLarge(YamlError):
    """Its aliases make the YAML larger, once expanded, than the bound."""


def expanded_size(text: bytes | str, limit: int) -> int:
    """How large `text` is once its aliases are expanded, as everything that writes or sends it
    expands them (a string aliased a thousand times is dumped a thousand times): the scalars'
    characters and one per node. Counted from the parser's events, so nothing expanded is built;
    ExpansionTooLarge past `limit`. Without an anchor (no `&`) nothing expands: its length."""
    if (b"&" not in text) if isinstance(text, bytes) else ("&" not in text):
        return len(text)
    sizes: dict[str, int] = {}  # anchor → size of its node, expanded
    open_nodes: list[list[Any]] = []  # [size so far, anchor] of the collections being read
    total = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                open_nodes.append([1, event.anchor])
                size = 1
            elif isinstance(event, yaml.CollectionEndEvent):
                node, anchor = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = node
                if open_nodes:
                    open_nodes[-1][0] += node
                continue  # counted in `total` as it was read
            elif isinstance(event, yaml.ScalarEvent):
                size = len(event.value) + 1
                if event.anchor is not None:
                    sizes[event.anchor] = size
            elif isinstance(event, yaml.AliasEvent):
                size = sizes.get(event.anchor or "", 0)  # an unknown anchor: the loader says so
            else:
                continue
            if open_nodes and not isinstance(event, yaml.CollectionStartEvent):
                open_nodes[-1][0] += size
            total += size
            if total > limit:
                raise ExpansionTooLarge(f"its YAML aliases expand it to more than {limit} bytes")
    except yaml.YAMLError as e:
        raise YamlError(f"not valid YAML: {_one_line(str(e))}") from e
    return total


def load_all(text: bytes | str, *, max_expanded: int | None = MAX_RESOURCE_LIST_BYTES) -> list[Any]:
    """Every YAML document of `text` (an empty document is None); ExpansionTooLarge when its
    aliases expand it past `max_expanded` (None: checked by the caller)."""
    if max_expanded is not None:
        expanded_size(text, max_expanded)
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as e:
        raise YamlError(f"not valid YAML: {_one_line(str(e))}") from e


def load(text: bytes | str) -> Any:
    documents = load_all(text)
    if len(documents) != 1:
        raise YamlError(f"expected one YAML document, found {len(documents)}")
    return documents[0]


def dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def dump_all(values: list[Any]) -> str:
    return yaml.dump_all(
        values, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_resource_list(data: bytes) -> dict[str, Any]:
    """The ResourceList in `data`; YamlError says why it is not one."""
    value = load(data)
    if not isinstance(value, dict):
        raise YamlError(f"a ResourceList is a mapping, not {type(value).__name__}")
    if value.get("kind") != KIND or value.get("apiVersion") not in _API_VERSIONS:
        raise YamlError(
            f"expected apiVersion {API_VERSION} and kind {KIND}, "
            f"found {value.get('apiVersion')!r} {value.get('kind')!r}"
        )
    items = value.get("items")
    if items is None:
        value["items"] = []
    elif not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise YamlError("items must be a list of mappings")
    config = value.get("functionConfig")
    if config is not None and not isinstance(config, dict):
        raise YamlError("functionConfig must be a mapping")
    return value


_NULLS = frozenset({"", "~", "null", "Null", "NULL"})


def _plain_scalar(event: Any) -> bool:
    return isinstance(event, yaml.ScalarEvent) and event.anchor is None and event.tag is None


def _is_null(event: Any) -> bool:
    return _plain_scalar(event) and not event.style and event.value in _NULLS  # plain, untagged


def _skip(events: Any, first: Any) -> None:
    """Consume the rest of the node `first` opens."""
    if not isinstance(first, yaml.CollectionStartEvent):
        return
    depth = 1
    while depth:
        event = next(events)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _plainly_without_results(data: bytes) -> bool:
    """Whether `data` is, beyond doubt, one ResourceList without `results` (True), read from the
    parser's events without building the document; False when it is not or it takes a closer
    look (results, tags, anchors or aliases at the top, a repeated key, anything unusual)."""
    try:
        events: Any = iter(yaml.parse(data, Loader=_Loader))
        head: list[Any] = [next(events) for _ in range(3)]
        if not (
            isinstance(head[0], yaml.StreamStartEvent)
            and isinstance(head[1], yaml.DocumentStartEvent)
            and isinstance(head[2], yaml.MappingStartEvent)
            and head[2].anchor is None
            and head[2].tag is None
        ):
            return False
        seen: dict[str, str | None] = {}
        key: Any
        while not isinstance(key := next(events), yaml.MappingEndEvent):
            if not _plain_scalar(key) or key.value in seen or key.value == "results":
                return False
            value: Any = next(events)
            seen[key.value] = value.value if _plain_scalar(value) else None
            if key.value == "items":
                if _is_null(value):
                    continue
                if not (isinstance(value, yaml.SequenceStartEvent) and value.anchor is None):
                    return False
                while not isinstance(item := next(events), yaml.SequenceEndEvent):
                    if not isinstance(item, yaml.MappingStartEvent) or item.tag is not None:
                        return False
                    _skip(events, item)
            elif key.value == "functionConfig":
                if _is_null(value):
                    continue
                if not (
                    isinstance(value, yaml.MappingStartEvent) and value.anchor is None and value.tag is None
                ):
                    return False
                _skip(events, value)
            elif isinstance(value, yaml.AliasEvent):
                return False
            else:
                _skip(events, value)
        if not isinstance(next(events), yaml.DocumentEndEvent) or not isinstance(
            next(events), yaml.StreamEndEvent
        ):
            return False
    except (yaml.YAMLError, StopIteration):
        return False
    return seen.get("kind") == KIND and seen.get("apiVersion") in _API_VERSIONS


def output_results(data: bytes) -> tuple[Result, ...]:
    """The results of a function's output, which must be a ResourceList (YamlError otherwise,
    TooManyResults past the bound). An output with no results is checked from the parser's
    events alone, which is cheaper than building it."""
    expanded_size(data, MAX_RESOURCE_LIST_BYTES)
    if _plainly_without_results(data):
        return ()
    return parse_results(parse_resource_list(data))


def resource_list(items: list[dict[str, Any]], *, function_config: dict[str, Any] | None = None) -> bytes:
    document: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "items": items}
    if function_config is not None:
        document["functionConfig"] = function_config
    return dump(document).encode()


def _count_nodes(value: Any, budget: list[int]) -> None:
    # Shared (aliased) YAML nodes are counted once per reference, so an alias bomb runs out.
    stack = [value]
    while stack:
        budget[0] -= 1
        if budget[0] < 0:
            raise YamlError(f"result values hold more than {MAX_RESULT_VALUE_NODES} nodes")
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def parse_results(document: dict[str, Any]) -> tuple[Result, ...]:
    """The `results` of a parsed ResourceList, validated and bounded."""
    raw = document.get("results")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise YamlError("results must be a list")
    if len(raw) > MAX_RESULTS:
        raise errors.TooManyResults(
            f"the function reported {len(raw)} results, over the bound of {MAX_RESULTS}"
        )
    budget = [MAX_RESULT_VALUE_NODES]
    results = []
    for index, entry in enumerate(raw):
        if isinstance(entry, dict) and isinstance(entry.get("field"), dict):
            _count_nodes([entry["field"].get("currentValue"), entry["field"].get("proposedValue")], budget)
        try:
            results.append(Result.model_validate(entry))
        except ValidationError as e:
            raise YamlError(f"results[{index}]: {describe(e)}") from e
    return tuple(results)


def describe(error: ValidationError) -> str:
    """A pydantic error as `field.path: what is wrong; ...`."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "(document)"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)
