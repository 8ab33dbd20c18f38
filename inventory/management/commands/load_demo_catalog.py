from django.core.management.base import BaseCommand

from inventory.demo import load_demo_catalog


class Command(BaseCommand):
    help = "Load the demo catalog from SPEC.md's figures (idempotent)."

    def handle(self, *args, **options):
        created = load_demo_catalog()
        self.stdout.write(f"Demo catalog loaded ({created} nodes created).")
