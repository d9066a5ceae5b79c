"""The pipeline: the rule contract, the registry, the context the rules see, applying their edits,
imports, leftovers, the output gate and the target table."""
