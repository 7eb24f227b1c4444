"""allocdiag's terminal UI (textual).  Renders diag's model only."""
