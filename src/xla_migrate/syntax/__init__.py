"""Source text to libcst trees and back, fast: parsing, tokens, nesting guard, positions, the read-only
walk, layout restoration, large files in pieces, and the small syntactic matchers."""
