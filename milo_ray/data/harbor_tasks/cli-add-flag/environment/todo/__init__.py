"""A tiny to-do list kept in a JSON file."""
