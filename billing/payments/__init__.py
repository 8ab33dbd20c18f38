"""Crypto payments: quotes, what the chain watchers report, rates and the customer's
payment pages.

services   — quotes and crediting each payment exactly once (every state change)
selectors  — reads for the payment pages
config     — the coins' configuration and the payment rules (settings)
coins/     — one watch-only adapter per chain (no Django models)
views, urls, admin — the customer's /pay/ pages and the operators' screens
"""
