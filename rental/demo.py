"""Demo machine images; loaded with the demo catalog by `manage.py load_demo`."""
from .models import Image

IMAGES = [
    ("pytorch-2.5-cuda-12.4", "PyTorch 2.5 · CUDA 12.4 · Ubuntu 22.04", "nvidia"),
    ("pytorch-2.5-rocm-6.4", "PyTorch 2.5 · ROCm 6.4 · Ubuntu 22.04", "amd"),
    ("cuda-12.4-base", "CUDA 12.4 base · Ubuntu 22.04", "nvidia"),
]


def load_demo_images() -> None:
    for slug, name, vendor in IMAGES:
        Image.objects.update_or_create(slug=slug, defaults={"name": name, "vendor": vendor})
