"""The pipeline: the rule contract, the registry, the context the rules see, applying their edits,
imports, leftovers, the output gate, the target table, and the records a migration reports (changes,
findings, input errors)."""
