-- MCP (issue 46): the tools a key may see and call, as the JSON list of its `mcp_tools`
-- patterns (`{server}__{tool pattern}`); NULL for a key that may use every tool.
ALTER TABLE api_keys ADD COLUMN mcp_tools TEXT;
