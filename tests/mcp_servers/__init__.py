"""MCP servers the MCP client's tests start (real servers on the official SDK)."""
