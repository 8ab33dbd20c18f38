"""Simplified Chinese number formats for this shop (the rest falls back to Django's zh_Hans).

Django's zh_Hans groups nothing (no thousands separator); Chinese storefronts and both
source documents write dollar prices as $1,690 and $12,170, so we group by three with a comma.
"""
DECIMAL_SEPARATOR = "."
THOUSAND_SEPARATOR = ","
NUMBER_GROUPING = 3
