"""The HTTP/JSON API (aiohttp) described in the v1 contract.

Owns request validation, error bodies, the OpenAPI document and forwarding to leaders.
"""
