import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', 'sample-app/.data/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-explicit-any': 'error',
      'no-restricted-syntax': [
        'error',
        { selector: "Identifier[name='__dirname']", message: 'Source must stay ESM-clean: use import.meta.url.' },
      ],
    },
  },
  {
    files: ['lib/src/**/*.ts'],
    rules: { 'no-console': 'error' },
  },
  {
    // The dashboard page: a plain browser module shipped as written (no bundler), so only the
    // browser's globals exist; listed here because the `globals` package is not a dependency.
    files: ['lib/src/dashboard/assets/**/*.js'],
    languageOptions: {
      sourceType: 'module',
      globals: Object.fromEntries(
        [
          'window',
          'document',
          'location',
          'history',
          'fetch',
          'confirm',
          'setTimeout',
          'clearTimeout',
          'Node',
          'URL',
          'AbortSignal',
        ].map((name) => [name, 'readonly']),
      ),
    },
    rules: {
      'no-console': 'error',
      // Every value shown may hold markup (payloads, errors, keys): it is never parsed as HTML.
      'no-restricted-syntax': [
        'error',
        {
          selector: 'MemberExpression[property.name=/^(innerHTML|outerHTML)$/]',
          message: 'Build elements with createElement and set textContent: data is never parsed as HTML.',
        },
        {
          selector:
            'CallExpression[callee.property.name=/^(insertAdjacentHTML|write|writeln|createContextualFragment)$/]',
          message: 'Build elements with createElement and set textContent: data is never parsed as HTML.',
        },
      ],
    },
  },
);
