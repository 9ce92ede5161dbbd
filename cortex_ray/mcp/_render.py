"""From the SDK's types to cortex-ray's MCP vocabulary: a listed tool to
:class:`McpToolDefinition`, a call's result to :class:`McpCallResult` (content rendered for a
model: text as is, images and audio summarised by type and size and never inlined, embedded
resources by their text, resource links by URI), an elicitation request to
:class:`McpElicitation` and its answer back."""

from __future__ import annotations

from typing import Any

from mcp import types

from cortex_ray.mcp._types import (
    McpCallResult,
    McpContent,
    McpElicitation,
    McpElicitationAnswer,
    McpToolAnnotations,
    McpToolDefinition,
)

__all__ = [
    "base64_size",
    "to_call_result",
    "to_content",
    "to_definition",
    "to_elicit_result",
    "to_elicitation",
]


def base64_size(data: str) -> int:
    """Bytes that base64 ``data`` decodes to (without decoding it)."""
    text = data.strip()
    if not text:
        return 0
    return max(0, len(text) * 3 // 4 - text[-2:].count("="))


def to_definition(tool: types.Tool) -> McpToolDefinition:
    hints = tool.annotations
    return McpToolDefinition(
        name=tool.name,
        title=tool.title or (hints.title if hints else None),
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {"type": "object"}),
        output_schema=dict(tool.output_schema) if tool.output_schema is not None else None,
        annotations=McpToolAnnotations(
            title=hints.title,
            read_only_hint=hints.read_only_hint,
            destructive_hint=hints.destructive_hint,
            idempotent_hint=hints.idempotent_hint,
            open_world_hint=hints.open_world_hint,
        )
        if hints is not None
        else McpToolAnnotations(),
    )


def to_content(block: Any) -> McpContent:
    """One content block as the model will see it."""
    if isinstance(block, types.TextContent):
        return McpContent(kind="text", text=block.text)
    if isinstance(block, types.ImageContent):
        return McpContent(kind="image", mime_type=block.mime_type, size=base64_size(block.data))
    if isinstance(block, types.AudioContent):
        return McpContent(kind="audio", mime_type=block.mime_type, size=base64_size(block.data))
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return McpContent(
                kind="resource",
                uri=str(resource.uri),
                mime_type=resource.mime_type,
                text=resource.text,
                size=len(resource.text.encode()),
            )
        return McpContent(
            kind="resource",
            uri=str(resource.uri),
            mime_type=resource.mime_type,
            size=base64_size(resource.blob),
        )
    if isinstance(block, types.ResourceLink):
        return McpContent(
            kind="resource_link",
            uri=str(block.uri),
            mime_type=block.mime_type,
            text=block.description or block.title or block.name,
            size=block.size,
        )
    # a block of a later revision this client does not know: say so, never guess at it
    kind_name = getattr(block, "type", type(block).__name__)
    return McpContent(kind="text", text=f"[unsupported content: {kind_name}]")


def to_call_result(result: types.CallToolResult) -> McpCallResult:
    structured = result.structured_content
    if structured is not None and not isinstance(structured, dict):
        structured = {"result": structured}
    return McpCallResult(
        is_error=bool(result.is_error),
        content=[to_content(block) for block in result.content],
        structured=structured,
    )


def to_elicitation(params: types.ElicitRequestParams) -> McpElicitation:
    if isinstance(params, types.ElicitRequestURLParams):
        return McpElicitation(message=params.message, url=params.url)
    return McpElicitation(message=params.message, requested_schema=dict(params.requested_schema))


def to_elicit_result(answer: McpElicitationAnswer) -> types.ElicitResult:
    content = answer.content if answer.action == "accept" else None
    return types.ElicitResult(action=answer.action, content=content)
