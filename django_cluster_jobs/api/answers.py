"""What an action answers: the object it acted on, as much of it as the caller may view.

A caller who may view the model gets the object's whole detail, as its detail URL shows it; one
who may only act gets a receipt: the object's identity, its state and a link to it. The view
passes ``full`` in the serializer's context; without it (as when the schema is generated) every
field is there, and the schema marks only the receipt's fields as always present.
"""

from __future__ import annotations

from typing import ClassVar

from rest_framework import serializers

from .serializers import JobDetailSerializer, NodeSerializer, RunDetailSerializer


class Answer(serializers.ModelSerializer):
    """Serialize only :attr:`receipt` when the context says the caller may not view the rest.

    Listed first among an answer's bases, before the serializer of what it answers with.
    """

    #: The fields every answer has, whatever the caller may view.
    receipt: ClassVar[tuple[str, ...]] = ()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        if self.context.get("full", True):
            return fields
        return {name: fields[name] for name in self.receipt}


class RunAnswerSerializer(Answer, RunDetailSerializer):
    """A run an action made or touched (prefetch ``events`` and ``logs``)."""

    receipt = ("id", "state", "url")
    url = serializers.HyperlinkedIdentityField(view_name="cluster_jobs_api:run-detail")

    class Meta(RunDetailSerializer.Meta):
        fields = (*RunDetailSerializer.Meta.fields, "url")
        read_only_fields = fields


class JobAnswerSerializer(Answer, JobDetailSerializer):
    """A job an action paused or resumed (annotated as for its detail)."""

    receipt = ("name", "paused", "paused_until", "url")
    url = serializers.HyperlinkedIdentityField(
        view_name="cluster_jobs_api:job-detail", lookup_field="name"
    )

    class Meta(JobDetailSerializer.Meta):
        fields = (*JobDetailSerializer.Meta.fields, "url")
        read_only_fields = fields


class NodeAnswerSerializer(Answer, NodeSerializer):
    """A node an action asked to drain (annotated as for its detail)."""

    receipt = ("node_id", "status", "url")
    url = serializers.HyperlinkedIdentityField(
        view_name="cluster_jobs_api:node-detail", lookup_field="node_id"
    )

    class Meta(NodeSerializer.Meta):
        fields = (*NodeSerializer.Meta.fields, "url")
        read_only_fields = fields
