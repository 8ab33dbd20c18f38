"""Root URLconf: mounts every app's urls."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from . import views

accounts = [
    path("signup/", views.signup, name="signup"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
]

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include(accounts)),
    path("", include("sizing.urls")),
    path("", include("inventory.urls")),
]
