"""YAML read with the 1.2 core schema's scalars, so a config means what it shows.

PyYAML implements YAML 1.1, whose implicit types surprise: ``steps: 1:30`` is the sexagesimal 90,
``name: no`` is ``False``, ``lr: 1e-3`` is the *string* "1e-3", ``seed: 010`` is octal 8. Configs are read
with YAML 1.2's rules instead, decided once here:

- booleans are only ``true`` / ``false`` (any case shown in the spec); ``yes``, ``no``, ``on``, ``off``
  are strings (a boolean setting still accepts them as the words they are, through validation);
- integers are decimal (``010`` is ten), ``0o17`` octal or ``0x1f`` hexadecimal; no ``1:30``, no ``1_000``:
  those stay strings, and a setting that wants a number says which key got a string;
- floats include exponents without a dot (``1e-3``, ``1e3``); an integer setting accepts a float that is
  whole (``steps: 1e3`` is 1000) and refuses one that is not, naming the key.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

BOOL, INT, FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema booleans, integers and floats, and mappings whose keys are
    given once."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """PyYAML keeps the last of two equal keys without a word (a second ``checkpoint:`` block would silently
        reset the first one's settings): a key given twice is an error naming it and both lines. A merge key's
        (``<<``) entries may be overridden: that is what it is for."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]}, again at line {line}): a key is "
                    "given once in a mapping; merge the two", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (BOOL, INT, FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
Yaml12Loader.add_implicit_resolver(INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
Yaml12Loader.add_implicit_resolver(
    FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _integer(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)  # YAML 1.2: a leading zero is still decimal


Yaml12Loader.add_constructor(INT, _integer)



def load_yaml(text: str) -> Any:
    """``text`` parsed with :class:`Yaml12Loader`."""
    return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 -- a SafeLoader subclass
