# The workbench: templates (image, start command, ports, variables), a lease's own image, registry credential, variables, sealed secrets and ports; the account's registry credentials and variables (rental.workbench).
from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion


class Migration(migrations.Migration):

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ('rental', '0016_idempotent_requests'),
    ]

    operations = [
        migrations.AddField(
            model_name='image',
            name='description',
            field=models.CharField(blank=True, max_length=300),
        ),
        migrations.AddField(
            model_name='image',
            name='env',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='image',
            name='generated_secret',
            field=models.CharField(blank=True, max_length=128),
        ),
        migrations.AddField(
            model_name='image',
            name='image_ref',
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddField(
            model_name='image',
            name='ports',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='image',
            name='start_command',
            field=models.TextField(blank=True, help_text='Run by /bin/sh -c beside sshd, as root, in /workspace'),
        ),
        migrations.AddField(
            model_name='lease',
            name='env',
            field=models.JSONField(blank=True, default=dict, help_text='Plain variables'),
        ),
        migrations.AddField(
            model_name='lease',
            name='image_ref',
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddField(
            model_name='lease',
            name='ports',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='lease',
            name='sealed_secrets',
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name='lease',
            name='secret_names',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='lease',
            name='start_command',
            field=models.TextField(blank=True),
        ),
        migrations.CreateModel(
            name='RegistryCredential',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=60)),
                ('server', models.CharField(help_text='e.g. ghcr.io, registry.example:5000', max_length=255)),
                ('username', models.CharField(max_length=255)),
                ('sealed_password', models.TextField()),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='registry_credentials', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['name', 'id'],
            },
        ),
        migrations.AddField(
            model_name='lease',
            name='registry_credential',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='leases', to='rental.registrycredential'),
        ),
        migrations.CreateModel(
            name='AccountVariable',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=128)),
                ('secret', models.BooleanField(default=False)),
                ('value', models.TextField(blank=True, help_text="A plain variable's value; empty for a secret")),
                ('sealed_value', models.TextField(blank=True, help_text="A secret's value, sealed")),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('customer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='account_variables', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['name', 'id'],
                'constraints': [models.UniqueConstraint(fields=('customer', 'name'), name='account_variable_name_once')],
            },
        ),
        migrations.AddConstraint(
            model_name='registrycredential',
            constraint=models.UniqueConstraint(fields=('customer', 'name'), name='registry_credential_name_once'),
        ),
    ]
