"""Services MILO and SSR share: seed derivation, the mutation runner, the agent-call
ledger, harness recording and the final test. A method decides *what* to do; these
modules do it the same way for both methods."""
