"""Train the image's iris classifier (run once, in the image's root, when the image is built).

scikit-learn ships the iris data in its package, so nothing is downloaded. The model and its class
names are saved together to the path given as the first argument.
"""

import sys

import joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

iris = load_iris()
model = LogisticRegression(max_iter=1000, random_state=0).fit(iris.data, iris.target)
accuracy = model.score(iris.data, iris.target)
assert accuracy > 0.9, f"the iris classifier is off: accuracy {accuracy:.3f}"
joblib.dump({"model": model, "classes": [str(c) for c in iris.target_names]}, sys.argv[1])
print(f"iris classifier saved to {sys.argv[1]} (training accuracy {accuracy:.3f})")
