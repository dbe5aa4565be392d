"""``bai``: the command-line client of the manager (REST and websockets, no Django)."""
