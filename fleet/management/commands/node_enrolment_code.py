"""A one-time enrolment code for a node, for operators at a shell:
`manage.py node_enrolment_code dfw-1-h100-sxm-01`. Printed once; only its hash is kept."""
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet.services import enrolment_code_create
from inventory.models import Node


class Command(BaseCommand):
    help = "Create a one-time enrolment code for a node (printed once) and show the agent's enrol command."

    def add_arguments(self, parser):
        parser.add_argument("node", help="The node's name, as in the admin")
        parser.add_argument("--url", default="https://YOUR-STOREFRONT", help="The storefront's public URL")

    def handle(self, *args, node: str, url: str, **options):
        try:
            target = Node.objects.get(name=node)
        except Node.DoesNotExist:
            raise CommandError(f"No node named {node!r}.") from None
        now = timezone.now()
        code = enrolment_code_create(node=target, actor=None, now=now)
        expires = now + settings.NODE_ENROLMENT_CODE_TTL
        self.stdout.write(code)
        self.stderr.write(f"One-time code for {target.name}, valid until {expires:%Y-%m-%d %H:%M} UTC. On the "
                          f"server, as root:\n  gpu-node-agent enrol --url {url} --code {code}")
