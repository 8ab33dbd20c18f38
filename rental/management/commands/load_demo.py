from django.core.management.base import BaseCommand

from inventory.demo import load_demo_catalog
from rental.demo import load_demo_images


class Command(BaseCommand):
    help = "Load the demo catalog (SPEC.md figures) and machine images; idempotent."

    def handle(self, *args, **options):
        created = load_demo_catalog()
        load_demo_images()
        self.stdout.write(f"Demo catalog loaded ({created} nodes created).")
