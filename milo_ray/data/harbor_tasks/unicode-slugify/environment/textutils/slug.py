"""URL slugs for article titles."""

import re


def slugify(text, max_length=50):
    """Turn `text` into a URL slug of lowercase ASCII letters, digits and single hyphens."""
    text = text.lower()
    text = re.sub(r"[^a-z0-9]+", "-", text)
    return text.strip("-")[:max_length]
