"""Just enough GraphQL to answer exactly what was asked: parse a query's selection and prune data to it.

gh decodes some answers strictly (its typed client refuses a field it did not ask for), so the local
GitHub API server builds a full object and keeps only the selected fields, under their aliases. Handles
fields, aliases, arguments (skipped), nested selections, inline fragments and named fragments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(
    r'\s+|,|#[^\n]*|"(?:\\.|[^"\\])*"|\.\.\.|[{}():!$=@\[\]]|[A-Za-z_][A-Za-z0-9_]*|-?[0-9.]+'
)


@dataclass
class Field:
    name: str
    alias: str
    children: list[Field | Spread] | None = None


@dataclass
class Spread:
    fragment: str | None  # a named fragment, or None for an inline fragment (its fields in children)
    children: list[Field | Spread] = field(default_factory=list)


def _tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text) if t.strip() and t != "," and not t.startswith("#")]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.fragments: dict[str, list[Field | Spread]] = {}

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.at += 1
        return token

    def skip_balanced(self, opening: str, closing: str) -> None:
        depth = 0
        while self.at < len(self.tokens):
            token = self.take()
            depth += (token == opening) - (token == closing)
            if depth == 0:
                return

    def document(self) -> list[Field | Spread]:
        operation: list[Field | Spread] = []
        while self.at < len(self.tokens):
            token = self.peek()
            if token == "fragment":
                self.take()
                name = self.take()
                self.take(), self.take()  # on Type
                self.fragments[name] = self.selection()
            elif token == "{":
                operation = self.selection()
            elif token == "(":
                self.skip_balanced("(", ")")
            else:
                self.take()  # query / mutation / its name
        return operation

    def selection(self) -> list[Field | Spread]:
        assert self.take() == "{"
        items: list[Field | Spread] = []
        while self.peek() not in ("}", ""):
            if self.peek() == "...":
                self.take()
                if self.peek() == "on":
                    self.take(), self.take()
                    items.append(Spread(None, self.selection()))
                else:
                    items.append(Spread(self.take()))
                continue
            name = self.take()
            alias = name
            if self.peek() == ":":
                self.take()
                name = self.take()
            if self.peek() == "(":
                self.skip_balanced("(", ")")
            while self.peek() == "@":  # a directive
                self.take(), self.take()
                if self.peek() == "(":
                    self.skip_balanced("(", ")")
            children = self.selection() if self.peek() == "{" else None
            items.append(Field(name, alias, children))
        self.take()
        return items


def parse(query: str) -> tuple[list[Field | Spread], dict[str, list[Field | Spread]]]:
    """The operation's top selection and the named fragments."""
    parser = _Parser(query)
    top = parser.document()
    return top, parser.fragments


def select(data: Any, query: str) -> Any:
    """data pruned to the query's selection (fields it lacks are null)."""
    top, fragments = parse(query)
    return _apply(data, top, fragments)


def _fields(items: list[Field | Spread], fragments: dict[str, list[Field | Spread]]) -> list[Field]:
    out: list[Field] = []
    for item in items:
        if isinstance(item, Field):
            out.append(item)
        else:
            out.extend(
                _fields(
                    item.children if item.fragment is None else fragments.get(item.fragment, []), fragments
                )
            )
    return out


def _apply(data: Any, items: list[Field | Spread] | None, fragments: dict[str, list[Field | Spread]]) -> Any:
    if items is None or data is None:
        return data
    if isinstance(data, list):
        return [_apply(entry, items, fragments) for entry in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for item in _fields(items, fragments):
        value = data.get(item.alias, data.get(item.name))
        merged = _apply(value, item.children, fragments)
        if isinstance(out.get(item.alias), dict) and isinstance(merged, dict):
            out[item.alias].update(merged)
        else:
            out[item.alias] = merged
    return out
