"""The tool contract: `BaseTool` (name, description, JSON-schema parameters) and `ToolResult`.

A tool never raises into the agent loop: `BaseTool.run` validates arguments against the schema
and turns every failure into an error `ToolResult` the model reads as its observation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError


@dataclass
class ToolResult:
    """What a tool returns: text for the model, an optional reward, and free-form info."""

    text: str
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: bool = False


class BaseTool(ABC):
    """A callable the model may invoke by name with JSON arguments.

    Subclasses set `name`, `description`, `parameters` (a JSON schema of an object) and implement
    `execute`. Raise `ToolError` (or any exception) for bad input: `run` converts it.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    def __init__(self) -> None:
        try:
            Draft202012Validator.check_schema(self.parameters)
        except SchemaError as exc:
            raise TypeError(f"tool {self.name!r} has an invalid parameters schema: {exc}") from exc
        self._validator = Draft202012Validator(self.parameters)

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema shown to the model."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> str | None:
        """Return a readable schema violation for `arguments`, or None when they are valid."""
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if not errors:
            return None
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "arguments"
        return f"invalid arguments for {self.name} at {where}: {first.message}"

    def run(self, arguments: Any) -> ToolResult:
        """Validate, execute, and convert any failure into an error result (never raises)."""
        try:
            problem = self.validate(arguments)
        except Exception as exc:  # e.g. RecursionError on arguments nested thousands deep
            return ToolResult(
                text=f"Error: cannot validate the arguments of {self.name}: {type(exc).__name__}",
                error=True,
                info={"exception": type(exc).__name__},
            )
        if problem is not None:
            return ToolResult(text=f"Error: {problem}", error=True)
        try:
            return self.execute(arguments)
        except Exception as exc:  # a tool bug or bad input must not end the episode
            return ToolResult(
                text=f"Error: {exc}", error=True, info={"exception": type(exc).__name__}
            )

    @abstractmethod
    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        """Do the work on schema-valid arguments."""


class ToolError(Exception):
    """Raised by a tool for input it refuses; the message is shown to the model."""
