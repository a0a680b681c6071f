"""The HTTP service: routes, request schemas and the jobs that run the core.

Profiles and requests name pipeline models by the registry's names: the service, which holds
both, hands the registry to the profiles' schema here, before any of them is validated.
"""

from device_profiles.schema import serve_pipeline_models
from perfmodel import pipelines

serve_pipeline_models(pipelines.names)
