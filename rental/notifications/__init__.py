"""What the store tells customers' (and operators') systems, and the ledger that
makes every message go out once.

- `Dispatch` is the notifications ledger: one row per (recipient, event, term) under a
  database unique constraint. An in-app notice's e-mail and every webhook delivery claim
  their row first, in the transaction that decides to send, so no beat run twice, retry,
  concurrent pass or duplicate task sends the same message twice.
- `WebhookEndpoint` (one per customer account, any number for operators) and
  `WebhookDelivery` (the delivery log; a redelivery is a new delivery of the same dispatch).
- Events come from rental (notices, instance ready, key destroyed), billing (order placed,
  invoice paid) and fleet (migration, incidents): they call `services.event_emit` or go
  through `rental.services.notify`, which emits the notice's event.

Layering: this package sits at the rental layer and imports nothing from billing or fleet;
they call into it."""
