"""MariaDB / MySQL through PyMySQL when mysqlclient is not installed.

Django's MySQL backend imports ``MySQLdb`` (mysqlclient) and refuses one older than 2.2.1.
PyMySQL speaks the same DB-API and installs itself under that name; a release that reports its
own version instead of the mysqlclient interface it provides is given that interface's.
"""

import importlib.util

#: The oldest mysqlclient Django 5.2 and 6.x accept.
MYSQLCLIENT_INTERFACE = (2, 2, 1, "final", 0)


def use_pymysql() -> None:
    """Serve ``import MySQLdb`` with PyMySQL, unless mysqlclient itself is installed."""
    if importlib.util.find_spec("MySQLdb") is not None:
        return
    import pymysql

    if pymysql.version_info < MYSQLCLIENT_INTERFACE:  # older PyMySQL releases report their own
        pymysql.version_info = MYSQLCLIENT_INTERFACE
    pymysql.install_as_MySQLdb()
