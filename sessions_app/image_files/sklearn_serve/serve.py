"""The model server of ``bai-kernel/sklearn-serve:1``: an iris classifier behind FastAPI.

Started by the endpoint's start command::

    uvicorn --app-dir /opt/model serve:app --host 0.0.0.0 --port 8000

``GET /health`` answers 200 once the model is loaded. ``POST /predict`` takes
``{"instances": [[sepal length, sepal width, petal length, petal width], ...]}`` and answers
``{"predictions": ["setosa", ...], "replica": "<id>"}``; the replica is the session id of the
kernel (every replica's host name is ``main1``), else the host name, so callers can see how
requests spread. A model folder mounted at ``$BAI_MODEL_DIR`` that holds a
``model.joblib`` (the same ``{"model", "classes"}`` dict) replaces the one built into the image.
"""

import os
import socket
from pathlib import Path

import joblib
from fastapi import FastAPI
from pydantic import BaseModel, conlist

BUILT_IN = Path(__file__).with_name("iris.joblib")
MAX_INSTANCES = 1024


def _model_path() -> Path:
    folder = os.environ.get("BAI_MODEL_DIR")
    if folder and (Path(folder) / "model.joblib").is_file():
        return Path(folder) / "model.joblib"
    return BUILT_IN


_saved = joblib.load(_model_path())
MODEL, CLASSES = _saved["model"], _saved["classes"]
REPLICA = os.environ.get("BACKENDAI_SESSION_ID") or socket.gethostname()

app = FastAPI(title="iris classifier")


class PredictRequest(BaseModel):
    instances: conlist(
        conlist(float, min_items=4, max_items=4), min_items=1, max_items=MAX_INSTANCES
    )


@app.get("/health")
def health() -> dict:
    return {"status": "ok", "replica": REPLICA, "model": str(_model_path())}


@app.post("/predict")
def predict(body: PredictRequest) -> dict:
    labels = MODEL.predict(body.instances)
    return {"predictions": [CLASSES[int(i)] for i in labels], "replica": REPLICA}
