"""rpc shell package (see README.md, Architecture)."""
