"""precompile shell package (see README.md, Architecture)."""
