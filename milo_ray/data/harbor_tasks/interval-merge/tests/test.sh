#!/bin/bash
# This task's hidden checks (/tests/test_outputs.py) run against /app; the shared runner
# writes /logs/verifier/reward.txt (fraction passed) and /logs/verifier/ctrf.json.
cd /app && python3 /tests/run_checks.py /tests/test_outputs.py
