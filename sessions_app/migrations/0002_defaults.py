"""A fresh install has the resource group `default` and a default resource policy."""

from django.db import migrations


def create_defaults(apps, schema_editor):
    ResourceGroup = apps.get_model("sessions_app", "ResourceGroup")
    ResourcePolicy = apps.get_model("sessions_app", "ResourcePolicy")
    ResourceGroup.objects.get_or_create(name="default", defaults={"description": "The default resource group"})
    if not ResourcePolicy.objects.filter(is_default=True).exists():
        ResourcePolicy.objects.create(
            name="default",
            is_default=True,
            max_concurrent_sessions=10,
            max_pending_sessions=20,
            max_containers_per_session=8,
        )


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0001_initial")]
    operations = [migrations.RunPython(create_defaults, migrations.RunPython.noop)]
