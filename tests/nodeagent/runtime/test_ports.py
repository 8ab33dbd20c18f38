"""The sshd port book: stable per lease, and never a port another instance on the host
already publishes (a lost state directory must not hand a live instance's port out again)."""
from nodeagent.runtime.ports import PortBook


def test_a_lease_keeps_its_port_and_new_leases_skip_published_ones(tmp_path):
    book = PortBook(tmp_path / "ports.json", (22500, 22503))
    # The book was lost; instances for leases 709 and 710 still publish 22500 and 22501.
    assert book.port_for(71, taken=frozenset({22500, 22501})) == 22502
    assert book.port_for(71, taken=frozenset({22500, 22501})) == 22502
    assert book.port_for(72, taken=frozenset({22500, 22501})) == 22503
    book.release(71)
    assert book.port_for(73, taken=frozenset({22500, 22501})) == 22502
