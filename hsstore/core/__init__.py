"""Records and pure functions every layer shares: errors, typed schemas, keys, provenance, planners."""
