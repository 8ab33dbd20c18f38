"""Demo machine images; loaded with the demo catalog by `manage.py load_demo`."""
from .models import Image

IMAGES = [
    ("pytorch-2.5-cuda-12.4", "PyTorch 2.5 · CUDA 12.4 · Ubuntu 22.04", "nvidia"),
    ("pytorch-2.5-rocm-6.4", "PyTorch 2.5 · ROCm 6.4 · Ubuntu 22.04", "amd"),
    ("cuda-12.4-base", "CUDA 12.4 base · Ubuntu 22.04", "nvidia"),
]

#: Templates: an image with its start command, ports and variables (rental.workbench). The
#: Jupyter one works out of the box: each lease gets its own JUPYTER_TOKEN (a secret, shown
#: once on the lease page), and Jupyter Lab listens on 8888 with that token.
JUPYTER_START = ('exec jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --allow-root '
                 '--ServerApp.root_dir=/workspace --IdentityProvider.token="$JUPYTER_TOKEN"')
TEMPLATES = [
    {"slug": "jupyter-pytorch-cuda", "name": "Jupyter · PyTorch · CUDA 12", "vendor": "nvidia",
     "image_ref": "quay.io/jupyter/pytorch-notebook:cuda12-latest", "start_command": JUPYTER_START,
     "ports": [8888], "env": {}, "generated_secret": "JUPYTER_TOKEN",
     "description": "Jupyter Lab on port 8888, signed in with a token made for each lease."},
]


def _image_rows() -> list[tuple[str, dict]]:
    return ([(slug, {"name": name, "vendor": vendor}) for slug, name, vendor in IMAGES]
            + [(t["slug"], {k: v for k, v in t.items() if k != "slug"}) for t in TEMPLATES])


def load_demo_images() -> None:
    """Idempotent; on a database without images (a new one, each test's), one INSERT."""
    if not Image.objects.exists():
        Image.objects.bulk_create([Image(slug=slug, **fields) for slug, fields in _image_rows()])
        return
    for slug, fields in _image_rows():
        Image.objects.update_or_create(slug=slug, defaults=fields)
