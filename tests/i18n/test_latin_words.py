"""Every page in Chinese, read as a Chinese reader sees it: no Latin word outside an
allow-list of product names, units and technical terms that Chinese texts keep in Latin
letters. This catches stored English (event reasons, link descriptions, GPU notes, invoice
lines, sizing modes), not only untranslated template strings."""
import html
import re

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from inventory.models import GpuModel
from tests.i18n.conftest import ZH
from tests.i18n.helpers import PUBLIC, customer_urls

# Names, units, API scope names (read, order, pay: what a token is created with), the sizing
# engine's method and mode codes (lora, qlora, full, single, zero-3: the calculator's own
# identifiers, shown beside the preset ids) and its inputs' values (all, q_proj) that stay Latin in Chinese product pages (as the Chinese source documents write them).
ALLOWED = set("""
GPU GPUs CPU vCPU RAM VRAM NVMe SSD SSH API URL UTC GB TB MB GiB TiB Gbit s h TFLOPS FLOPs FLOPS PFLOPS
NVIDIA AMD CUDA ROCm NVLink NVSwitch DCGM Infinity Fabric PCIe Gen Gen4 Gen5 HGX SXM HBM HBM2e HBM3 HBM3e GDDR6 GDDR6X ECC
H100 H200 A100 MI300X L40S RTX A6000 A5000 A40 B200 L4 Ada PCIe
BTC ETH USDT USDC XMR SOL LTC DEMO Bitcoin Ethereum Monero Solana Litecoin
LoRA QLoRA ZeRO ZeRO-2 ZeRO-3 Adam AdamW FP8 FP16 BF16 bf16 fp16 fp32 int8 bit bits bitsandbytes DeepSpeed FSDP
Llama Mistral Mixtral Qwen Gemma Phi DeepSeek Falcon Yi PyTorch Hugging Face Transformers PEFT TRL Unsloth
Ubuntu Docker JSON CSV PDF QR SLA LUKS LUKS2 OpenAPI Bearer Authorization IP TOTP htmx
DFW IAD PDX LAS ORD Dallas Ashburn Hillsboro InfiniBand English B rank checkpoint CSRF Cookie ID
Tether USD base W read order manage pay FlashAttention FlashAttention-2 Liger Kernel Trainer axolotl torchtune
torchao logit logits Logits config json epoch token offload ZeRO-Offload ZeRO-0 ZeRO-1 N all framework hf
Jupyter lora qlora full single zero-3 config.json ssh-ed25519 ssh-rsa ecdsa-sha2-nistp256 ecdsa-sha2-nistp384 ecdsa-sha2-nistp521 T
""".split()) | set(settings.OPERATOR_NAME.split())
LATIN_WORD = re.compile(r"(?<![\w.])[A-Za-z][\w.]*(?:[-'][\w.]+)*")


def latin_words(page: str) -> set[str]:
    body = page.split("<body", 1)[-1].split(">", 1)[-1]
    body = re.sub(r"<(script|style|code|pre|textarea)\b.*?</\1>", " ", body, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    text = re.sub(r"\S+@\S+|\S*/\S*", " ", text)  # e-mail addresses, URLs and paths are not prose
    return {w for w in LATIN_WORD.findall(text) if w not in ALLOWED and not _is_name_or_unit(w)}


def _is_name_or_unit(word: str) -> bool:
    """Model names with digits (7B, 8x7B, gpu0, v2, preset ids like llama-2-13b), site codes,
    hex ids, and the test's own user names."""
    return bool(re.fullmatch(r"[A-Za-z]?\d[\w.-]*|[A-Za-z]+\d+[\w.-]*|[A-Z]{3}-\d+|[a-z][a-z0-9.]*(?:-[a-z0-9.]+)+|\w+_proj|alice|bob|op|root", word))


@pytest.fixture
def zh_pages(client, shop):  # noqa: F811
    urls = [reverse(name, args=args) for name, args in PUBLIC]
    urls += list(customer_urls(shop).values())
    urls += [reverse(n) for n in ("status", "sla_terms", "terms", "privacy")]
    urls += [reverse("gpu_detail", args=[slug]) for slug in GpuModel.objects.values_list("slug", flat=True)]
    return {url: client.get(url, **ZH) for url in urls}


def test_no_latin_words_outside_the_allow_list_on_chinese_pages(zh_pages):
    offenders = {url: sorted(latin_words(r.content.decode())) for url, r in zh_pages.items()
                 if r.status_code == 200}
    offenders = {url: words for url, words in offenders.items() if words}
    assert not offenders, offenders


def test_a_leases_harder_days_read_in_chinese(client, catalog, customer, settings):
    """The Chinese walk over the pages of a lease's harder days: a lease whose node is down, then moved, with a
    renewal due; its renewal invoice (ordered in English, read in Chinese); the DEMO coin's
    quote page; the refund limit used up; the 404 page."""
    from billing.payments.services import quote_create
    from billing.refunds import lease_refund
    from rental.failover import incident_migrate
    from rental.i18n import remember_language
    from rental.services import customer_settings_update
    from tests.experience.scenes import node_down, renewal_due, running_lease

    settings.HOST_AGENT_FAKE_DELAY = 0
    settings.DEMO_PAYMENTS = True
    remember_language(customer, "zh-hans")  # a Chinese customer: notices are written in Chinese
    lease_refund(lease=running_lease(customer), actor=customer)
    customer_settings_update(user=customer, email="", auto_renew=False)
    lease = running_lease(customer)
    incident = node_down(lease)
    client.force_login(customer)
    pages = {"lease, node down": client.get(reverse("lease_detail", args=[lease.pk]), **ZH)}
    incident_migrate(incident=incident)
    invoice = renewal_due(lease)
    quote = quote_create(invoice=invoice, coin="DEMO", now=timezone.now())
    pages |= {
        "lease, moved, renewal due": client.get(reverse("lease_detail", args=[lease.pk]), **ZH),
        "renewal invoice": client.get(reverse("billing:invoice", args=[invoice.pk]), **ZH),
        "demo quote": client.get(reverse("payments:quote", args=[quote.pk]), **ZH),
        "order, refund used": client.get(reverse("order", args=["rtx-3090"]), **ZH),
        "settings with notices": client.get(reverse("account_settings"), **ZH),
        "sizing tables": client.get(reverse("sizing_tables"), **ZH),
    }
    page = pages["lease, moved, renewal due"].content.decode()
    assert "已迁移到正常硬件" in page and "续费：支付账单" in page
    assert "RTX 3090，1 周（7 天）" in pages["renewal invoice"].content.decode() or "续费租约" in pages[
        "renewal invoice"].content.decode()
    assert "演示——不是真实地址" in pages["demo quote"].content.decode()
    offenders = {name: sorted(latin_words(r.content.decode())) for name, r in pages.items()}
    offenders = {name: words for name, words in offenders.items() if words}
    assert not offenders, offenders
