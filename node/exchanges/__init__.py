"""Exchanges: named routers that write each published message to the topics its routing key
matches (`model`: the replicated definitions; `matcher`: the routing tables)."""
