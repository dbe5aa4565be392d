from django.apps import AppConfig


class ServingAppConfig(AppConfig):
    name = "serving_app"
    verbose_name = "Inference endpoints"
