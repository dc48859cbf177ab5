-- The two databases `npm run test:mssql` runs against (docs/sql-server.md, "Running the contract suite
-- against SQL Server"). docker-compose.mssql.yml and the CI workflow run this file with
-- `sqlcmd -b -i`; running it again changes nothing. test/unit/tsql-grammar.spec.ts parses it.
--
-- sqlqueue_test (SQLQUEUE_MSSQL_URL): READ_COMMITTED_SNAPSHOT and ALLOW_SNAPSHOT_ISOLATION
-- off, the defaults of SQL Server: READ COMMITTED reads take shared locks.
-- sqlqueue_rcsi (SQLQUEUE_MSSQL_RCSI_URL): both on, the defaults of Azure SQL Database:
-- READ COMMITTED reads see row versions, and SNAPSHOT transactions are allowed.
-- Both have Service Broker enabled (the broker-*.mssql.spec.ts files use it).
-- sqlqueue_nobroker: Service Broker disabled, for the broker setup check's clear boot error
-- (broker-setup.mssql.spec.ts reaches it through SQLQUEUE_MSSQL_URL with this database name).
IF DB_ID(N'sqlqueue_test') IS NULL CREATE DATABASE [sqlqueue_test];
GO
IF DB_ID(N'sqlqueue_rcsi') IS NULL CREATE DATABASE [sqlqueue_rcsi];
GO
IF DB_ID(N'sqlqueue_nobroker') IS NULL CREATE DATABASE [sqlqueue_nobroker];
GO
-- READ_COMMITTED_SNAPSHOT changes only while no other connection is in the database:
-- ROLLBACK IMMEDIATE ends any that are (a test run left over from before).
ALTER DATABASE [sqlqueue_test] SET READ_COMMITTED_SNAPSHOT OFF WITH ROLLBACK IMMEDIATE;
GO
ALTER DATABASE [sqlqueue_test] SET ALLOW_SNAPSHOT_ISOLATION OFF;
GO
ALTER DATABASE [sqlqueue_rcsi] SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;
GO
-- Waits (PENDING_ON) until transactions open in the database have finished.
ALTER DATABASE [sqlqueue_rcsi] SET ALLOW_SNAPSHOT_ISOLATION ON;
GO
-- A new database gets a new broker identifier and usually the broker on, but a restored or
-- attached one comes back with it off: set it either way. ENABLE_BROKER and DISABLE_BROKER need
-- exclusive access to the database: ROLLBACK IMMEDIATE ends other sessions' transactions.
ALTER DATABASE [sqlqueue_test] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE;
GO
ALTER DATABASE [sqlqueue_rcsi] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE;
GO
ALTER DATABASE [sqlqueue_nobroker] SET DISABLE_BROKER WITH ROLLBACK IMMEDIATE;
GO
