from django.urls import path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("gpus/", views.catalog, name="catalog"),
    path("gpus/<slug:slug>/", views.gpu_detail, name="gpu_detail"),
    path("links/", views.links, name="links"),
    path("storage/", views.storage, name="storage"),
    path("faq/", views.faq, name="faq"),
    path("status/", views.status, name="status"),
    path("terms/", views.terms, name="terms"),
    path("privacy/", views.privacy, name="privacy"),
]
