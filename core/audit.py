"""Who acts, for the audit trail: while a team member acts for an account, the rows that name
the account as actor name the member instead. Model-free, so that the API and the teams'
rights (rental) set it and the trail's writer (inventory.audit.audit_record, beside its
AuditEntry model) reads it."""
from contextlib import contextmanager
from contextvars import ContextVar

#: (account id, member) while a customer's request acts for an account (rental.teams.rights).
_acting: ContextVar[tuple[int, object] | None] = ContextVar("acting_member", default=None)


@contextmanager
def acting_member(*, account_id: int, member):
    """While a member acts for an account, the audit rows that name the account as actor
    name the member instead: services are called with the account (whose objects they
    check and change), and the trail must say which person of the team acted."""
    token = _acting.set((account_id, member))
    try:
        yield
    finally:
        _acting.reset(token)


def audit_actor(actor):
    """The actor to record: the acting member in place of the account they act for."""
    acting = _acting.get()
    if acting is not None and getattr(actor, "pk", None) == acting[0]:
        return acting[1]
    return actor
