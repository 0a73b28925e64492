"""How items are shown."""


def format_item(item):
    box = "x" if item["done"] else " "
    return f"[{box}] {item['id']} ({item['priority']}) {item['title']}"
