"""storage shell package (see README.md, Architecture)."""
