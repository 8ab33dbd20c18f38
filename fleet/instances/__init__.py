"""The customer's side of a lease's instance: the lease page's buttons and the signed sanitization record."""
