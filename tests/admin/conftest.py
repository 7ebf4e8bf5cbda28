"""Fixtures of the admin tests."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User


@pytest.fixture
def staff(client):
    """Log ``client`` in as a staff user who may view everything, plus ``codenames``."""

    def login(*codenames: str):
        user = User.objects.create_user("operator", is_staff=True)
        perms = Permission.objects.filter(codename__startswith="view_")
        user.user_permissions.set([*perms, *Permission.objects.filter(codename__in=codenames)])
        client.force_login(user)
        return client

    return login
