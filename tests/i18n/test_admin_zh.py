"""Our own admin additions follow the operator's language too: with the language cookie set
to zh-hans the ops dashboard, the lease changelist's actions and filters and the node
changelist's actions come out in Chinese; the action names posted back stay the same."""
from django.conf import settings
from django.utils import timezone

from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image

from .conftest import visible

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def test_admin_additions_in_chinese_by_the_operators_cookie(client, operator, catalog, customer):
    checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                         site=Site.objects.get(code="DFW-1"), term="week",
                         image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                         pay_from_balance=False, now=timezone.now())
    client.force_login(operator)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"

    dashboard = visible(client.get("/admin/ops/dashboard/"))
    for text in ("运营仪表盘", "本月净收入", "按机房和型号统计 GPU", "定时任务", "待销毁密钥", "72 小时内到期的续费",
                 "卡在处理中的报价单（超过 1 小时）", "型号", "排空中"):
        assert text in dashboard, text
    for english in ("Operations dashboard", "Revenue booked this month", "Keys pending destruction", "Scheduled jobs"):
        assert english not in dashboard, english

    leases = visible(client.get("/admin/rental/lease/"))
    for text in ("免费延长一个租期", "立即停机（停止实例，保留槽位）…", "恢复（租期未结束的已停机租约）",
                 "立即释放（归还槽位，销毁磁盘密钥）…", "24 小时内到期", "保留期 24 小时内结束",
                 "租约编号（如 42 或 #42）或客户用户名"):
        assert text in leases, text
    assert "Extend by one term, free of charge" not in leases
    for action in ("extend_free", "suspend_now", "resume", "release"):  # what the form posts is unchanged
        assert f'value="{action}"' in leases

    nodes = visible(client.get("/admin/inventory/node/"))
    for text in ("排空：所选节点不再接受新租约", "取消排空：重新接受新租约",
                 "将运行中的租约迁移到同一机房的其他节点（硬件故障）"):
        assert text in nodes, text
    assert "Drain: take no new leases" not in nodes
    assert 'value="drain"' in nodes and 'value="migrate_leases"' in nodes

    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"  # and the same pages in English for an English operator
    assert "Drain: take no new leases on the selected nodes" in visible(client.get("/admin/inventory/node/"))
