"""epistream inside agent frameworks (docs/mcp.md, "From agent frameworks"): one module per framework, each
needing that framework's extra and imported by name (``from epistream.integrations.langchain import ...``);
nothing else in the product imports them, so the base install never needs a framework."""
