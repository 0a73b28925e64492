#!/bin/bash
set -euo pipefail
cat > /app/textutils/slug.py <<'PY'
"""URL slugs for article titles."""

import re
import unicodedata


def slugify(text, max_length=50):
    """Turn `text` into a URL slug of lowercase ASCII letters, digits and single hyphens."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return text[:max_length].rstrip("-") or "untitled"
PY
