"""Shared machinery behind anygate's optional integrations.

Import the public modules instead: :mod:`anygate.httpx` and :mod:`anygate.httpx2` (a gated
transport for httpx / httpx2 clients, and so for the OpenAI and Anthropic SDKs) and
:mod:`anygate.asgi` (a busy gate for ASGI routes). Nothing here imports httpx or httpx2;
the flavour modules hand their own classes in, so one implementation serves both.
"""
