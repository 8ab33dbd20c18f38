"""Template tags for the page frame ({% load parts %}, registered in settings.TEMPLATES)."""
from django import template

register = template.Library()


@register.simple_tag(takes_context=True)
def rendered(context, template_name: str):
    """`template_name` rendered with the page's context once, to be shown more than once:
    the site's links appear inline on wide screens and again in the phone menu (base.html),
    and each {% include %} would render them, and their tags, again."""
    with context.push():
        return context.template.engine.get_template(template_name).render(context)
