"""A module that cannot be imported: it needs what no trainer has."""

import no_such_module_of_the_users  # noqa: F401
