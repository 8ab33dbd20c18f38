"""A runtime and disk backend for an agent on a node without leases: nothing to run, for
tests that drive the agent's rounds and reports without Docker or disks."""


class NoInstances:
    def guard(self) -> None: ...

    def lease_ids(self) -> list[int]:
        return []

    def unpause_all(self, *, except_leases) -> list[int]:
        return []
