"""Extensions created unbound; `create_app` binds them with `init_app`."""

from typing import TYPE_CHECKING

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

# Named constraints let Alembic alter and drop them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


db = SQLAlchemy(model_class=Base)


def init_migrations(app: Flask, directory: str) -> None:
    """Flask-Migrate on `app`: `app.extensions["migrate"]`, which migrations/env.py and
    `flask_migrate.upgrade()` read, and its `db` command group. Flask-Migrate imports Alembic,
    a sixth of a command's start-up, so it is imported when this is called, not with this
    module (commands/__init__.py calls it when `db` runs)."""
    from flask_migrate import Migrate

    Migrate(app, db, directory=directory, compare_type=True)


# The models' base class. It is `db.Model`, but a type checker cannot take an attribute of an
# instance as a base class (python/mypy#8603), so it sees what `db.Model` is made of instead:
# Flask-SQLAlchemy's model mixin (`query`, `__fsa__`) over our declarative `Base`.
if TYPE_CHECKING:
    import flask_sqlalchemy.model

    class Model(flask_sqlalchemy.model.Model, Base):
        __abstract__ = True

else:
    Model = db.Model
