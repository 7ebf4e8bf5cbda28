"""What the admin tests share: the admin's URLs and its pages as text."""

from __future__ import annotations

from django.urls import reverse


def url(model: str, view: str = "changelist", *args: object) -> str:
    return reverse(f"admin:cluster_jobs_{model}_{view}", args=args)


def page(client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()
