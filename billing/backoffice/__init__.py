"""Operators' customer desk: one page per customer (balance, leases, invoices, payments,
tokens) with the two money actions an operator needs — a balance adjustment and a refund
of a paid invoice to the balance — each with a reason, audited."""
